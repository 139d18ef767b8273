"""Config files are checked as a whole, with one clear line per problem."""

from pathlib import Path

import pytest

from broker.config import BrokerConfig, ConfigError, build_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topiary.toml"
    path.write_text(text)
    return path


def test_file_values_apply_and_flags_override_them(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 8000\nhost = "127.0.0.2"\n[limits]\nkeepalive = 5\n')
    config = build_config(path, port=9000)
    assert (config.host, config.port, config.keepalive) == ("127.0.0.2", 9000, 5)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[server]\nprot = 1\n", "unknown key 'prot' in [server]"),
        ("[sever]\nport = 1\n", "unknown table [sever]"),
        ("[server]\nport = 'x'\n", "port must be int"),
        ("[server]\nport = 70000\n", "port must be in 0..65535"),
        ("[server]\nlog_format = 'xml'\n", "log_format must be"),
        ("[limits]\nkeepalive = -1\n", "keepalive must be in"),
        ("[limits]\nmax_payload = 2000000\n", "max_payload must be in"),
        ("[limits]\nturn_frames = 0\n", "turn_frames must be in 1..100000"),
        ("[limits]\nturn_time = 0\n", "turn_time must be in (0, 1] seconds"),
        ("[limits]\nturn_time = 'fast'\n", "turn_time must be int or float"),
        ("[http]\nrequest_timeout = 0\n", "http_request_timeout must be in (0, 86400]"),
        ("[http]\nrequest_timeout = 'x'\n", "http_request_timeout must be int or float"),
        ("[server\n", "not valid TOML"),
        ("server = 1\n", "server must be a table"),
    ],
)
def test_bad_config_files_are_refused_with_the_reason(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace("(", r"\(")):
        build_config(write(tmp_path, text))


def test_http_request_timeout_comes_from_the_file_and_defaults_to_the_servers(
    tmp_path: Path,
) -> None:
    from broker.http.server import REQUEST_TIMEOUT

    assert BrokerConfig().http_request_timeout == REQUEST_TIMEOUT
    path = write(tmp_path, '[http]\nlisten = "127.0.0.1:0"\nrequest_timeout = 2.5\n')
    assert build_config(path).http_request_timeout == 2.5


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        build_config(tmp_path / "nope.toml")


def test_booleans_are_not_numbers() -> None:
    with pytest.raises(ConfigError, match="port must be int"):
        BrokerConfig(port=True)


def test_the_documented_config_file_is_valid(tmp_path: Path) -> None:
    import re

    docs = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
    block = re.search(r"```toml\n(.*?)```", docs.read_text(), re.S)
    assert block is not None
    config = build_config(write(tmp_path, block.group(1)))
    assert (config.overflow, config.group_prefetch, config.auth_token) == (
        "drop-oldest",
        64,
        "secret",
    )
