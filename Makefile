# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo lint bench clean browser

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# tests/test_dashboard.py needs Debian's Chromium and ChromeDriver (these machines run as
# root and reach Debian's packages); nothing is done when both are there already.
CHROMIUM     := /usr/bin/chromium /usr/bin/chromedriver
browser:
	@for f in $(CHROMIUM); do test -x $$f || missing=1; done; \
	if [ -n "$$missing" ]; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q chromium chromium-driver \
		|| { apt-get update -q && apt-get install -y -q chromium chromium-driver; }; \
	fi

# MQTT.js, the Node client the MQTT front-end tests run (tests/js/mqtt_sub.js, mqtt_pub.js),
# at the exact versions in tests/js/package-lock.json; reinstalled when the lock changes.
JS_STAMP := tests/js/node_modules/.installed
$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund
	touch $(JS_STAMP)

test: $(STAMP) browser $(JS_STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m bridges.demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) bench/filter_throughput.py --json bench/results/filter_throughput.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache build *.egg-info
