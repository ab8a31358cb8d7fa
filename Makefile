# Every target bootstraps .venv itself: a fresh machine needs only Python 3.11 and this repo.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The model libraries the real-library tests build from (torchvision, timm, transformers), and pytorch-grad-cam
# (a reference that needs torchvision), in a venv of their own: torchvision does not import beside the CPU-only
# torch build of .venv (constraints-libraries.txt). LXT too, without the heavy dependencies it declares (the
# transformer benchmark imports only its torchvision patch).
LIBS     := .venv-libraries
LIBSTAMP := $(LIBS)/.installed
FMNIST := /usr/share/datasets/fashion-mnist
# pip keeps no cache: the two venvs take about 2 GB and 6.4 GB (the CUDA build of torch), and a cache of what they
# download would only add to that on a machine that builds them once. A failed install prints the free space.
PIP     := -m pip install --no-cache-dir
NOSPACE  = { df -h . >&2; echo "error: installing $(@D) failed; if pip said 'No space left on device', free about 9 GB (.venv 2 GB, $(LIBS) 6.4 GB) and run make again" >&2; exit 1; }

.PHONY: demo test docs notebooks bench atlas sweep checkpoints data syslibs reportdeps clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP) --upgrade pip setuptools wheel || $(NOSPACE)
	$(PY) $(PIP) -c constraints.txt -e '.[test]' || $(NOSPACE)
	touch $(STAMP)

$(LIBSTAMP): pyproject.toml constraints-libraries.txt
	$(PYTHON) -m venv $(LIBS)
	$(LIBS)/bin/python $(PIP) --upgrade pip setuptools wheel || $(NOSPACE)
	$(LIBS)/bin/python $(PIP) -c constraints-libraries.txt torch torchvision || $(NOSPACE)
	$(LIBS)/bin/python $(PIP) -c constraints-libraries.txt -e . timm transformers safetensors pytest grad-cam \
	  nbclient nbformat ipykernel hypothesis zennit || $(NOSPACE)
	$(LIBS)/bin/python $(PIP) --no-deps -c constraints-libraries.txt lxt || $(NOSPACE)
	touch $(LIBSTAMP)

# Debian's full Fashion-MNIST, for the full-dataset tests and for training the shipped checkpoints.
# Installed when we are root with apt; otherwise those tests skip (outside CI) with a message.
data:
	@if [ -d $(FMNIST) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	else echo "note: $(FMNIST) missing (sudo apt-get install dataset-fashion-mnist); full-dataset tests will skip"; fi

# The shared libraries opencv loads (Quantus imports it; Quantus is a test dependency for the parity
# tests). Installed when we are root with apt; otherwise those tests skip with a message.
syslibs:
	@if ldconfig -p | grep -q 'libGL.so.1 ' && ldconfig -p | grep -q 'libglib-2.0.so.0 '; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgl1 libglib2.0-0; \
	else echo "note: libGL / GLib missing (sudo apt-get install libgl1 libglib2.0-0); the Quantus parity tests will skip"; fi

# What the report's checks need: pdflatex and bibtex (the LaTeX report must compile), poppler's pdftoppm and
# pdftotext (the PDF is read as a printed page) and Chromium (index.html must render). Installed when we are root
# with apt; otherwise those tests skip.
reportdeps:
	@if command -v pdflatex >/dev/null 2>&1 && command -v bibtex >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 \
	  && command -v pdftoppm >/dev/null 2>&1 && command -v pdftotext >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    texlive-latex-base texlive-latex-recommended poppler-utils chromium >/dev/null; \
	else echo "note: pdflatex / pdftoppm / chromium missing (sudo apt-get install texlive-latex-recommended poppler-utils chromium); the LaTeX and browser tests will skip"; fi

demo: $(STAMP)
	$(PY) -m audit demo

# ruff first (a second), then three jobs at once, none niced, so that the two cores stay busy to the end: the main
# suite in two processes (pytest-xdist; the tests of a file in one of them) of one torch thread each (its tensors are
# small, and a second intra-op thread cost a fifth more CPU time for no shorter run), the engine on the model
# libraries (their own venv; MODEL_LIBRARIES=required makes a missing library a failure, not a skip; its
# enumerated-model tests, two forked children at a time, run last, in a fresh process: when the main suite ends
# first, they fill both cores) and mypy. A niced library suite waited for the main one: the two ran one after the
# other. The library suite's output goes to .test-libraries.log, mypy's to .test-mypy.log (tail -f them to follow);
# both are shown at the end.
LIBTESTS = tests/audit/models/test_libraries.py tests/audit/models/test_library_twins.py \
	  tests/attributions/test_cam.py "tests/test_notebooks.py::test_notebook_executes[collapse_atlas]" \
	  tests/test_examples.py::test_model_library_block_runs \
	  tests/benchmarks/test_method_sweep.py::test_the_sweep_holds_on_a_sample_of_the_library_models \
	  tests/attributions/test_rules.py::test_generalized_gamma_matches_zennit_on_signed_inputs \
	  tests/attributions/test_rules.py::test_deeplift_is_complete_through_efficientvits_linear_attention_where_the_model_computes_in_float64 \
	  tests/attributions/test_attention_maps.py::test_attention_grad_cam_reads_the_patch_rows_where_the_head_never_reads_the_class_token
test: $(STAMP) $(LIBSTAMP) data syslibs reportdeps
	$(VENV)/bin/ruff check attributions audit bort reports benchmarks tests docs
	@echo "model-library suite and mypy started beside the main suite; their logs: .test-libraries.log, .test-mypy.log"
	@{ MODEL_LIBRARIES=required OMP_NUM_THREADS=1 $(LIBS)/bin/python -m pytest -q -p no:cacheprovider --durations=10 \
	  $(LIBTESTS); first=$$?; MODEL_LIBRARIES=required OMP_NUM_THREADS=1 $(LIBS)/bin/python -m pytest -q \
	  -p no:cacheprovider --durations=5 tests/test_model_libraries.py && test $$first -eq 0; } \
	  > .test-libraries.log 2>&1 & libraries=$$!; \
	{ start=$$(date +%s); $(VENV)/bin/mypy; typed=$$?; echo "mypy took $$(($$(date +%s) - start)) s"; exit $$typed; } \
	  > .test-mypy.log 2>&1 & types=$$!; \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=20; main=$$?; \
	wait $$types; typed=$$?; wait $$libraries; status=$$?; \
	echo "--- mypy (.test-mypy.log) ---"; cat .test-mypy.log; \
	echo "--- model-library suite (.test-libraries.log) ---"; cat .test-libraries.log; \
	test $$main -eq 0 && test $$typed -eq 0 && test $$status -eq 0

# The documentation site (Sphinx: the guides in docs/, the API from the docstrings, the notebooks with their
# outputs), with warnings as errors; open docs/_build/html/index.html.
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: $(CURDIR)/docs/_build/html/index.html"

# The notebooks executed in place at their full settings, their outputs stored (the docs show them as stored);
# the collapse atlas in .venv-libraries (timm). One torch thread: two contend on a busy 2-core machine.
notebooks: $(STAMP) $(LIBSTAMP)
	@for nb in notebooks/*.ipynb; do case $$nb in *collapse_atlas*) py=$(LIBS)/bin/python;; *) py=$(PY);; esac; \
	  echo "executing $$nb"; env -u MPLBACKEND OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore:IProgress not found,ignore::FutureWarning:torch.jit._script" $$py -c \
	  "import sys, nbclient, nbformat; nb = nbformat.read(sys.argv[1], 4); nbclient.NotebookClient(nb, timeout=1800, \
	  kernel_name='python3', record_timing=False, resources={'metadata': {'path': 'notebooks'}}).execute(); \
	  nbformat.write(nb, sys.argv[1])" $$nb || exit 1; done

# Every speed table of docs/speed.md, measured in one run and written to docs/benchmarks with its date, commit and
# machine: the toolkit's own benchmarks in .venv (with Quantus, the [bench] extra), then the model libraries' and
# LXT's in .venv-libraries. Run it on a quiet machine.
bench: $(STAMP) $(LIBSTAMP)
	$(PY) $(PIP) -q -c constraints.txt -e '.[bench]' || $(NOSPACE)
	$(PY) -m benchmarks --out docs/benchmarks
	PYTHONPATH=. $(LIBS)/bin/python -m benchmarks --out docs/benchmarks library_costs transformer_lrp twins_library

# The collapse atlas in full: every timm architecture module's smallest model and every chain method (hours on
# 2 cores); writes atlas/atlas.csv and atlas/atlas.png, and the copies the documentation shows, with their date,
# commit and command, into docs/atlas. A rerun measures only the models not measured yet.
atlas: $(LIBSTAMP)
	PYTHONPATH=. $(LIBS)/bin/python -m benchmarks.atlas --out atlas --publish docs/atlas

# Every method on every enumerated library model: an exact map of the input's shape, the toolkit's refusal, or a
# failure (hours on 2 cores); writes sweep/sweep.csv and the copies the documentation shows, with their date,
# commit and command, into docs/sweep. A rerun sweeps only the models not swept yet.
sweep: $(LIBSTAMP)
	PYTHONPATH=. $(LIBS)/bin/python -m benchmarks.method_sweep --out sweep --publish docs/sweep

checkpoints: $(STAMP) data
	$(PY) -m audit retrain-shipped

clean:
	rm -rf $(VENV) $(LIBS) *.egg-info .pytest_cache docs/_build docs/_generated docs/tutorials .test-libraries.log .test-mypy.log
