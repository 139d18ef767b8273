"""The ``topiary`` command: serve, pub, sub, stats, sessions, routes, witness.

Client commands find the broker with ``--server HOST:PORT``, else the
``TOPIARY_SERVER`` environment variable, else 127.0.0.1:7474. Either may be a list,
``A,B``: the command uses the first server that accepts, and moves to the next when the
one it is on goes (for up to ``FAILOVER_SECONDS``); ``pub --confirm`` sends again what was
not confirmed, ``sub --durable`` resumes its session there. They speak TLS with
``--tls`` or ``--ca FILE`` (``--cert``/``--key`` for a client certificate; or the
variables ``TOPIARY_CA``, ``TOPIARY_CERT``, ``TOPIARY_KEY``). They log in with
``--username`` (else ``TOPIARY_USERNAME``) and the first line of ``--password-file`` (else
``TOPIARY_PASSWORD``); never a password on the command line. Every bad
argument is one line on stderr and exit status 2; a failure at run time (the
broker is unreachable, refused a request, a timeout) is one line and status 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from functools import partial
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, NoReturn

import trio

import routing
from broker.address import DEFAULT_PORT, parse_servers, split_address
from broker.commands import COMMANDS_GROUP, UsageError, listen_address, tune_gc

if TYPE_CHECKING:
    from broker.ha.tls import PairTls

DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"
#: With several servers, how long a command keeps trying them after losing its connection
#: (a hot spare takes over in about a second) before it fails with the last error.
FAILOVER_SECONDS = 30.0

EXIT_USAGE = 2
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def _servers(text: str) -> str:
    """``--server``: ``HOST:PORT`` or a comma-separated list of them (checked, kept as
    given: ``connect`` takes it so)."""
    try:
        parse_servers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_server_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        type=_servers,
        metavar="HOST:PORT[,HOST:PORT...]",
        help=f"the broker, or a list to fail over along (default: $TOPIARY_SERVER, else "
        f"{DEFAULT_SERVER})",
    )


def _resolve_servers(args: argparse.Namespace) -> None:
    """``args.server`` from ``--server``, else ``TOPIARY_SERVER``, else the default; a bad
    ``TOPIARY_SERVER`` is a usage error naming the variable."""
    if args.server is not None:
        return
    text = os.environ.get("TOPIARY_SERVER") or DEFAULT_SERVER
    try:
        parse_servers(text)
    except ValueError as exc:
        raise UsageError(f"TOPIARY_SERVER: {exc}") from None
    args.server = text


def _connect_options(args: argparse.Namespace) -> dict[str, Any]:
    """What every client command passes to ``connect``: the servers, TLS, the login, and
    with several servers, reconnecting along them."""
    options: dict[str, Any] = {"tls": _tls(args), **args.login}
    if len(parse_servers(args.server)) > 1:
        options.update(reconnect=True, reconnect_timeout=FAILOVER_SECONDS)
    return options


def _host_port(text: str) -> str:
    """A peer broker's or a listener's HOST:PORT: as ``--server``, but the port is required
    (IPv6 in brackets: ``[::1]:7474``)."""
    try:
        split_address(text, default_port=None)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """A client command's TLS options; the environment gives the defaults."""
    tls = parser.add_argument_group("TLS")
    tls.add_argument(
        "--tls",
        action="store_true",
        help="speak TLS; the broker's certificate is verified (system CAs, or --ca) and must "
        "name the host dialled",
    )
    environ = os.environ
    for flag, variable, what in (
        ("--ca", "TOPIARY_CA", "CA certificates to verify the broker with (implies --tls)"),
        ("--cert", "TOPIARY_CERT", "client certificate to present (implies --tls; with --key)"),
        ("--key", "TOPIARY_KEY", "the client certificate's private key"),
    ):
        tls.add_argument(
            flag, metavar="FILE", default=environ.get(variable) or None, help=f"{what}; ${variable}"
        )


def _tls(args: argparse.Namespace) -> Any:
    """The client TLS context the arguments ask for, or None for plain TCP."""
    if not (args.tls or args.ca or args.cert or args.key):
        return None
    if (args.cert is None) != (args.key is None):
        raise UsageError("--cert and --key go together")
    from broker.client import tls_context
    from broker.config import ConfigError

    try:
        return tls_context(args.ca, args.cert, args.key)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="topiary", description="A smart event broker gateway.")
    parser.add_argument("--version", action="version", version="topiary 0.1.0")
    parser.set_defaults(run=None)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = commands.add_parser("serve", help="run a broker")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help=f"port to listen on (default {DEFAULT_PORT})")
    serve.add_argument("--data-dir", help="directory for stored sessions and messages")
    serve.add_argument("--log-format", choices=["console", "json"], help="log output format")
    serve.add_argument("--config", help="TOML config file (see docs/operations.md)")
    serve.add_argument(
        "--broker-id",
        "--server-id",
        dest="server_id",
        metavar="ID",
        help="this broker's id, unique in a mesh of peers (default topiary-PID; with [ha] the "
        "pair's id, the same on both brokers)",
    )
    serve.add_argument(
        "--peer",
        type=_host_port,
        action="append",
        metavar="HOST:PORT",
        help="a peer broker to link to (repeat for several; see docs/peering.md)",
    )
    serve.add_argument(
        "--http",
        type=listen_address,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz, /readyz and the dashboard page there (docs/operations.md)",
    )
    serve.add_argument(
        "--mqtt",
        type=listen_address,
        metavar="HOST:PORT",
        help="serve MQTT 3.1.1 and 5.0 over TCP there (docs/mqtt.md)",
    )
    serve.add_argument(
        "--mqtt-ws",
        type=listen_address,
        metavar="HOST:PORT",
        help="serve MQTT over WebSocket there (path /mqtt, subprotocol mqtt)",
    )
    serve.add_argument(
        "--peer-secret",
        metavar="SECRET",
        help="shared secret that peer links must present (PEER_HELLO)",
    )
    serve.add_argument(
        "--users",
        metavar="FILE",
        help="users file (made with `topiary passwd`): clients log in; see docs/security.md",
    )

    pub = commands.add_parser("pub", help="publish messages")
    _add_server_argument(pub)
    _add_tls_arguments(pub)
    pub.add_argument("--confirm", action="store_true", help="wait for the broker's PUBACK")
    pub.add_argument(
        "--retain",
        action="store_true",
        help="make it the topic's retained message (an empty message deletes it)",
    )
    pub.add_argument("topic")
    pub.add_argument("message", nargs="?", help="the payload; without it, one per stdin line")

    sub = commands.add_parser("sub", help="print messages as JSON lines")
    _add_server_argument(sub)
    _add_tls_arguments(sub)
    sub.add_argument("--dialect", choices=["native", "mqtt"], default="native")
    sub.add_argument("--count", type=_positive_int, help="exit 0 after N messages")
    sub.add_argument(
        "--timeout",
        type=_positive_seconds,
        help="stop after this many seconds (an error if --count was not reached)",
    )
    sub.add_argument("--client-id", help="this subscriber's id (required with --durable)")
    sub.add_argument(
        "--durable",
        action="store_true",
        help="use a durable session: the broker keeps what arrives while this id is away",
    )
    sub.add_argument(
        "--group",
        help="join shared group NAME: the members share one durable session, each message "
        "goes to one of them",
    )
    sub.add_argument(
        "--ack",
        choices=["auto", "manual"],
        default="auto",
        help="durable sessions: ack each message once printed (auto), or never (manual: "
        "messages stay pending and come again next time)",
    )
    sub.add_argument(
        "--sync",
        action="store_true",
        help="wait until every reachable peer broker has installed the route before "
        "reporting the subscription (see docs/peering.md)",
    )
    sub.add_argument("filters", nargs="+", metavar="FILTER")

    stats = commands.add_parser("stats", help="print the broker's counters as JSON")
    _add_server_argument(stats)
    _add_tls_arguments(stats)

    routes = commands.add_parser("routes", help="print the broker's route table as JSON")
    _add_server_argument(routes)
    _add_tls_arguments(routes)

    sessions = commands.add_parser("sessions", help="print the durable sessions as JSON")
    _add_server_argument(sessions)
    _add_tls_arguments(sessions)

    session = commands.add_parser("session", help="manage one durable session")
    actions = session.add_subparsers(dest="action", required=True, parser_class=_Parser)
    drop = actions.add_parser("drop", help="delete a durable session and its stored messages")
    _add_server_argument(drop)
    _add_tls_arguments(drop)
    drop.add_argument("client_id", metavar="ID")

    ha = commands.add_parser("ha", help="hot-spare pair commands (docs/ha.md)")
    ha_commands = ha.add_subparsers(dest="ha_command", required=True, metavar="COMMAND")
    ha_status = ha_commands.add_parser(
        "status",
        help="each listed broker's role, term, replication lag, last contact and fencing",
    )
    _add_server_argument(ha_status)
    _add_tls_arguments(ha_status)

    for client_command in (pub, sub, stats, routes, sessions, drop, ha_status):
        _add_login_arguments(client_command)

    passwd = commands.add_parser(
        "passwd",
        help="add or change a user of a users file (the password from the terminal or stdin)",
    )
    passwd.add_argument("file", metavar="FILE", help="the users file (created if missing)")
    passwd.add_argument("name", metavar="NAME", help="the user name")
    passwd.add_argument(
        "--group",
        action="append",
        metavar="G",
        help="a group of the user (repeat for several); replaces the user's groups",
    )
    passwd.add_argument("--delete", action="store_true", help="delete the user instead")

    witness = commands.add_parser(
        "witness", help="run the witness that breaks ties between a hot-spare pair (docs/ha.md)"
    )
    witness.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    witness.add_argument(
        "--port", type=_port, default=7480, help="port to listen on (default 7480)"
    )
    witness.add_argument("--data-dir", required=True, help="directory for the term file")
    keys = witness.add_mutually_exclusive_group(required=True)
    keys.add_argument("--secret", help="the pair's [ha] secret (visible in ps: prefer --config)")
    keys.add_argument("--config", help="a TOML file with [ha] secret (and lease)")
    witness.add_argument(
        "--lease", type=_positive_seconds, help="seconds a lease lasts (default: [ha] lease, 1.0)"
    )
    witness.add_argument(
        "--cert", help="PEM certificate: serve over mutual TLS (with --key and --ca)"
    )
    witness.add_argument("--key", help="PEM private key of --cert")
    witness.add_argument(
        "--ca", help="PEM CA that the brokers' certificates must chain to ([ha] ca)"
    )
    witness.add_argument("--log-format", choices=["console", "json"], default="console")

    for plugin in entry_points(group=COMMANDS_GROUP):
        plugin.load()(commands)
    return parser


def _add_login_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--username", metavar="NAME", help="log in as NAME (default: $TOPIARY_USERNAME)"
    )
    parser.add_argument(
        "--password-file",
        metavar="FILE",
        help="the password is FILE's first line (default: $TOPIARY_PASSWORD)",
    )


def _login(args: argparse.Namespace) -> dict[str, str]:
    """``connect``'s username and password from the flags or the environment, or nothing."""
    username = args.username or os.environ.get("TOPIARY_USERNAME") or None
    password = os.environ.get("TOPIARY_PASSWORD") or None
    if args.password_file is not None:
        try:
            with open(args.password_file, encoding="utf-8") as handle:
                password = handle.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise UsageError(f"cannot read password file {args.password_file}: {why}") from None
    if username is None and password is not None:
        raise UsageError("a password needs a user name: --username or TOPIARY_USERNAME")
    if username is not None and password is None:
        raise UsageError(
            f"user {username!r} needs a password: --password-file FILE or TOPIARY_PASSWORD"
        )
    if username is None:
        return {}
    assert password is not None
    return {"username": username, "password": password}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"topiary {args.command}"
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "passwd":
            return _passwd(args)
        if args.command == "witness":
            return _witness(args)
        if hasattr(args, "password_file"):  # a client command
            args.login = _login(args)
            _resolve_servers(args)
        if args.command == "pub":
            _check_topic(args.topic)
            return trio.run(_pub, args)
        if args.command == "sub":
            for text in args.filters:
                _check_filter(text, args.dialect)
            if args.durable and not args.client_id:
                raise UsageError("--durable needs --client-id")
            if args.group is not None and not 0 < len(args.group.encode()) <= 256:
                raise UsageError("--group must be 1..256 bytes")
            if args.durable and args.ack == "auto" and len(args.filters) > 1:
                # Acks are cumulative by sequence number; with two filters their messages
                # could be printed out of sequence order and an ack would cover one unprinted.
                raise UsageError("--durable with --ack auto takes one FILTER")
            if args.client_id is not None and not 0 < len(args.client_id.encode()) <= 256:
                raise UsageError("--client-id must be 1..256 bytes")
            return trio.run(_sub, args)
        if args.command in ("stats", "routes"):
            return trio.run(_print_query, args, args.command)
        if args.command == "sessions":  # a list in the broker's order (by client id)
            return trio.run(partial(_print_query, args, "sessions", sort_keys=False))
        if args.command == "ha":
            prog = "topiary ha status"
            return trio.run(_ha_status, args)
        if args.command == "session":
            prog = "topiary session drop"
            return trio.run(_session_drop, args)
        if args.run is not None:  # a command from a plugin
            prog = args.prog
            return int(args.run(args))
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line for the operator; the type says what kind
        print(f"{prog}: {_describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    raise AssertionError(args.command)


def _describe(exc: BaseException) -> str:
    from broker.client import BrokerError, ConnectionLost

    if isinstance(exc, BrokerError):
        return f"refused by the broker: {exc.code}: {exc.text}"
    if isinstance(exc, ConnectionLost):
        return f"connection lost: {exc}"
    if isinstance(exc, OSError):
        return f"cannot reach the broker: {exc.strerror or exc}"
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        from broker.security.tls import describe_failure

        return f"TLS handshake failed: {describe_failure(exc)}"
    if isinstance(exc, trio.TooSlowError):
        return "timed out"
    from broker.store import StoreError

    if isinstance(exc, StoreError):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"


def _check_topic(topic: str) -> None:
    try:
        routing.validate_topic(topic)
    except routing.TopicError as exc:
        raise UsageError(f"invalid topic: {exc}") from None


def _check_filter(text: str, dialect: str) -> None:
    try:
        routing.parse_filter(text, dialect)
    except routing.TopicError as exc:
        raise UsageError(f"invalid filter: {exc}") from None


# -- serve ----------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from broker.config import ConfigError, build_config
    from broker.listeners import ListenError
    from broker.log import configure_logging
    from broker.server import run_broker

    try:
        config = build_config(
            args.config,
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            log_format=args.log_format,
            server_id=args.server_id,
            peers=tuple(args.peer) if args.peer else None,
            peer_secret=args.peer_secret,
            http_listen=args.http,
            mqtt_listen=args.mqtt,
            mqtt_websocket=args.mqtt_ws,
            auth_users=args.users,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if config.data_dir is not None:
        try:
            os.makedirs(config.data_dir, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot use data dir {config.data_dir}: {exc.strerror}") from None
    configure_logging(config.log_format)
    tune_gc()
    try:
        trio.run(lambda: run_broker(config, handle_signals=True))
    except ConfigError as exc:  # a file the config names (users, ACL, certificates) is bad
        raise UsageError(str(exc)) from None
    except ListenError as exc:  # names the port and the key that asked for it
        print(f"topiary serve: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _witness(args: argparse.Namespace) -> int:
    from broker.config import DEFAULT_LEASE, ConfigError, check_ha_timing, load_config_file
    from broker.ha.termfile import TermFileError
    from broker.ha.witness import run_witness
    from broker.log import configure_logging

    secret, lease = args.secret, DEFAULT_LEASE
    tls_files = {"ca": args.ca, "cert": args.cert, "key": args.key}
    try:
        if args.config is not None:
            settings = load_config_file(args.config)
            secret = settings.get("ha_secret")
            lease = settings.get("ha_lease", lease)
            if not isinstance(secret, str) or not secret:
                raise UsageError(f"{args.config}: [ha] secret is required for the witness")
            if not any(tls_files.values()):  # the flags, else [ha] ca, cert, key
                tls_files = {name: settings.get(f"ha_{name}") for name in tls_files}
        lease = args.lease if args.lease is not None else lease
        check_ha_timing(lease, lease / 2)  # only the lease matters to the witness
        tls = _witness_tls(tls_files)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not secret:
        raise UsageError("--secret must not be empty")
    configure_logging(args.log_format)
    try:
        trio.run(
            partial(
                run_witness,
                args.host,
                args.port,
                args.data_dir,
                secret.encode(),
                lease=float(lease),
                tls=tls,
                handle_signals=True,
            )
        )
    except TermFileError as exc:
        print(f"topiary witness: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        print(
            f"topiary witness: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return 0


def _witness_tls(files: dict[str, Any]) -> PairTls | None:
    """The witness' mutual TLS from ``--ca --cert --key`` (all three or none), or None;
    a missing or bad file is a one-line ``ConfigError``."""
    from broker.ha.tls import PairTls

    given = [name for name, path in files.items() if path]
    if not given:
        return None
    if len(given) != len(files):
        raise UsageError(
            "--ca, --cert and --key go together (mutual TLS: the witness checks the brokers' "
            f"certificates against --ca), got only {', '.join(f'--{name}' for name in given)}"
        )
    return PairTls(files["ca"], files["cert"], files["key"], what="witness")


def _passwd(args: argparse.Namespace) -> int:
    from broker.security.passwd import PasswdError, edit_user, read_password

    try:
        password = None if args.delete else read_password()
        done = edit_user(
            args.file, args.name, groups=args.group, delete=args.delete, password=password
        )
    except PasswdError as exc:
        print(f"topiary passwd: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{done} user {args.name!r} in {args.file}", file=sys.stderr)
    return 0


# -- client commands ------------------------------------------------------------------------


def _quiet_logs() -> None:
    from broker.log import configure_logging

    configure_logging("console", level=30)  # warnings and up: stdout stays pure JSON


async def _pub(args: argparse.Namespace) -> int:
    from broker.client import connect

    _quiet_logs()
    async with connect(args.server, **_connect_options(args)) as client:
        if args.message is not None:
            await client.publish(
                args.topic, os.fsencode(args.message), confirm=args.confirm, retain=args.retain
            )
            return 0
        stdin = trio.wrap_file(sys.stdin.buffer)
        async for line in stdin:
            payload = line[:-1] if line.endswith(b"\n") else line
            await client.publish(args.topic, payload, confirm=args.confirm, retain=args.retain)
    return 0


def _render(message: Any) -> str:
    record: dict[str, Any] = {"topic": message.topic}
    try:
        record["payload"] = message.payload.decode("utf-8")
    except UnicodeDecodeError:
        record["payload"] = base64.b64encode(message.payload).decode("ascii")
        record["encoding"] = "base64"
    record["seq"] = message.seq
    record["id"] = message.id
    if message.headers:
        record["headers"] = message.headers
    return json.dumps(record, ensure_ascii=False)


async def _sub(args: argparse.Namespace) -> int:
    from broker.client import connect

    _quiet_logs()
    received = 0
    out = sys.stdout
    deadline = trio.current_time() + args.timeout if args.timeout else float("inf")
    with trio.move_on_at(deadline) as waiting:
        async with (
            connect(
                args.server,
                client_id=args.client_id,
                durable=args.durable,
                group=args.group,
                **_connect_options(args),
            ) as client,
            AsyncExitStack() as stack,
        ):
            subs = [
                await stack.enter_async_context(
                    client.subscribe(text, args.dialect, sync=args.sync)
                )
                for text in args.filters
            ]
            print(f"subscribed to {', '.join(args.filters)}", file=sys.stderr, flush=True)
            merged_send, merged_receive = trio.open_memory_channel[Any](0)
            async with trio.open_nursery() as nursery:
                for sub in subs:
                    nursery.start_soon(_forward, sub, merged_send.clone())
                merged_send.close()
                seen: set[tuple[str | None, int]] = set()
                async for message in merged_receive:
                    key = (message.server, message.seq)  # seqs count per broker
                    if key in seen:  # one MSG, several of our subscriptions
                        continue
                    seen.add(key)
                    if len(seen) > 100_000:
                        seen.clear()
                    print(_render(message), file=out, flush=True)
                    received += 1
                    if args.ack == "auto" and args.group is not None:
                        await client.ack(message.seq, single=True, server=message.server)
                    elif args.ack == "auto" and args.durable:
                        await client.ack(message.seq, server=message.server)
                    if args.count is not None and received >= args.count:
                        nursery.cancel_scope.cancel()
                        break
    if waiting.cancelled_caught and args.count is not None and received < args.count:
        print(
            f"topiary sub: timed out after {args.timeout:g} s with {received} of "
            f"{args.count} messages",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return 0


async def _forward(sub: Any, send: trio.MemorySendChannel[Any]) -> None:
    async with send:
        async for message in sub:
            await send.send(message)


async def _print_query(args: argparse.Namespace, query: str, *, sort_keys: bool = True) -> int:
    """``topiary stats|routes|sessions``: one request, its answer printed as JSON."""
    from broker.client import connect

    _quiet_logs()
    async with connect(args.server, **_connect_options(args)) as client:
        answer = await getattr(client, query)()
    print(json.dumps(answer, indent=2, sort_keys=sort_keys))
    return 0


#: What ``topiary ha status`` shows of a primary's STATS ``ha`` section, in this order.
HA_STATUS_KEYS = (
    "role", "ha_term", "seq", "lag_records", "lag_bytes", "in_sync",
    "seconds_since_contact", "seconds_since_witness", "lease_left", "fenced_seconds",
)  # fmt: skip


async def _ha_status(args: argparse.Namespace) -> int:
    """``topiary ha status``: one JSON line per listed broker. A primary answers STATS (its
    ``ha`` section); a standby refuses clients with NOT_PRIMARY, and its refusal carries
    its state (docs/ha.md). Status 1 when no broker answered."""
    from broker.client import BrokerError, connect

    _quiet_logs()
    options = {"tls": _tls(args), **args.login}
    answered = 0
    for host, port in parse_servers(args.server):
        server = f"{host}:{port}"
        line: dict[str, Any] = {"server": server}
        try:
            with trio.fail_after(10):
                async with connect((host, port), **options) as client:
                    stats = await client.stats()
            ha = stats.get("ha")
            if ha is None:
                line["role"] = "single"
            else:
                line.update({key: ha[key] for key in HA_STATUS_KEYS if key in ha})
                line["fenced"] = ha.get("role") == "fenced" or bool(ha.get("fenced"))
            answered += 1
        except BrokerError as exc:
            if exc.code != "NOT_PRIMARY":
                line["error"] = f"{exc.code}: {exc.text}"
            else:
                line["role"] = "standby"
                line.update(_standby_state(exc.text))
                answered += 1
        except (OSError, trio.TooSlowError) as exc:
            line["error"] = f"unreachable: {exc}"
        print(json.dumps(line))
    return 0 if answered else EXIT_FAILURE


def _standby_state(text: str) -> dict[str, Any]:
    """The ``key=value`` words a standby's NOT_PRIMARY text carries (numbers as numbers)."""
    state: dict[str, Any] = {}
    for word in text.replace(";", " ").replace(",", " ").split():
        key, sep, value = word.partition("=")
        if not sep:
            continue
        try:
            state[key] = int(value)
        except ValueError:
            try:
                state[key] = float(value)
            except ValueError:
                state[key] = value
    return state


async def _session_drop(args: argparse.Namespace) -> int:
    from broker.client import connect

    _quiet_logs()
    async with connect(args.server, **_connect_options(args)) as client:
        dropped = await client.drop_session(args.client_id)
    if not dropped:
        print(f"topiary session drop: no durable session {args.client_id!r}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps({"dropped": args.client_id}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
