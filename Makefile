# Convenience targets; each calls the same bootstrap script the README uses.
PY ?= python3
VENV_PY = .venv/bin/python

.PHONY: demo test setup book serve-book figures bench-decode clean

demo:            ## install what is missing, then run the demo
	$(PY) scripts/bootstrap.py demo

test:            ## install what is missing, then run the whole test suite
	$(PY) scripts/bootstrap.py test

setup:           ## install only
	$(PY) scripts/bootstrap.py setup

book: setup      ## build the course site into book/build
	.venv/bin/mdbook build book

serve-book: setup ## serve the site at http://localhost:3000 with live reload
	.venv/bin/mdbook serve book

figures: setup   ## redraw the book's figures (book/src/figures/*.png) from the code
	$(VENV_PY) scripts/figures/phase05.py
	$(VENV_PY) scripts/figures/phase06.py

clean:
	rm -rf book/build .pytest_cache
