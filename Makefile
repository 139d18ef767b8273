# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo lint bench clean debs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Debian packages tests use (these machines run as root and reach Debian's packages):
# Chromium and ChromeDriver for the page tests (tests/test_dashboard.py), Mosquitto and
# nats-server for the side-by-side benchmarks' smoke tests. Nothing is done when all are
# there already.
DEB_FILES    := /usr/bin/chromium /usr/bin/chromedriver /usr/sbin/mosquitto /usr/sbin/nats-server
DEB_PACKAGES := chromium chromium-driver mosquitto nats-server
debs:
	@for f in $(DEB_FILES); do test -x $$f || missing=1; done; \
	if [ -n "$$missing" ]; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q $(DEB_PACKAGES) \
		|| { apt-get update -q && apt-get install -y -q $(DEB_PACKAGES); }; \
	fi

# MQTT.js, the Node client the MQTT front-end tests run (tests/js/mqtt_sub.js, mqtt_pub.js),
# at the exact versions in tests/js/package-lock.json; reinstalled when the lock changes.
JS_STAMP := tests/js/node_modules/.installed
$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund
	touch $(JS_STAMP)

test: $(STAMP) debs $(JS_STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	$(PY) -m bridges.demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) bench/filter_throughput.py --json bench/results/filter_throughput.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache build *.egg-info
