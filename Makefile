# Convenience targets; each calls the same bootstrap script the README uses.
PY ?= python3
VENV_PY = .venv/bin/python

.PHONY: demo test test-fast lint format setup book serve-book figures clean

demo:            ## install what is missing, then run the demo
	$(PY) scripts/bootstrap.py demo

test:            ## install what is missing, then run the whole test suite
	$(PY) scripts/bootstrap.py test

test-fast: setup ## the engine's own tests (tests/engine), without the real weights: the quick loop
	$(VENV_PY) -m pytest -n 2 tests/engine -m "not real_weights"

lint:            ## what CI checks first: ruff's lint rules and formatting (pyproject.toml)
	$(PY) scripts/bootstrap.py lint

format: setup    ## fix what ruff can fix, then format
	$(VENV_PY) -m ruff check --fix .
	$(VENV_PY) -m ruff format .

setup:           ## install only
	$(PY) scripts/bootstrap.py setup

book: setup      ## build the course site into book/build
	.venv/bin/mdbook build book

serve-book: setup ## serve the site at http://localhost:3000 with live reload
	.venv/bin/mdbook serve book

figures: setup   ## redraw the book's figures (book/src/figures/*.png) from the code
	for script in scripts/figures/phase*.py; do $(VENV_PY) $$script || exit 1; done

clean:
	rm -rf book/build .pytest_cache

.PHONY: browser-check
browser-check: setup ## the site in headless Chromium (apt-get install -y chromium): no page wider than its column; screenshots in book/build/screenshots/
	MINI_VLLM_REQUIRE_BROWSER=1 $(VENV_PY) -m pytest -q tests/course/test_site_browser.py
