# Palimpsest — every target works on a fresh machine: `install` runs first where it is needed.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROTOS  := $(wildcard protos/palimpsest/v1/*.proto)
GEN_DIR := palimpsest/v1

.PHONY: install protos protos-check lint typecheck run demo test test-fast test-store bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The runtime plus the extras for tests, the demo (the Ollama simulator), codegen and the type checker.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,demo,codegen,dev]'
	touch $@

# npm is needed for buf (`make lint`, with ruff) only: run, test and demo work without it.
node_modules/.installed: package.json
	npm install --no-audit --no-fund --silent
	touch $@

install: $(VENV)/.installed

# Regenerates the committed Python code (messages, stubs and .pyi type stubs) from protos/, and the
# descriptor set with the protos' comments that server reflection serves (grpcurl describe shows them).
# grpc_tools writes no .pyi for the *_pb2_grpc modules: mypy-protobuf's grpc plugin does, so the
# servicers' request and context types (grpc.aio.ServicerContext[Req, Resp]) are checked, not Any.
protos: $(VENV)/.installed
	rm -f $(GEN_DIR)/*_pb2*.py $(GEN_DIR)/*_pb2*.pyi $(GEN_DIR)/palimpsest.binpb
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. \
		--plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=. $(PROTOS)
	$(BIN)/python -m grpc_tools.protoc -Iprotos --include_source_info --descriptor_set_out=$(GEN_DIR)/palimpsest.binpb $(PROTOS)

# Fails when the committed generated code is not what `make protos` produces.
protos-check: protos
	git diff --exit-code -- $(GEN_DIR) || (echo "generated code is stale: run 'make protos' and commit" >&2; exit 1)
	test -z "$$(git status --porcelain -- $(GEN_DIR))" || (echo "untracked generated files: run 'make protos' and commit" >&2; exit 1)

lint: node_modules/.installed $(VENV)/.installed
	cd protos && ../node_modules/.bin/buf lint
	$(BIN)/ruff check palimpsest bench ollama_sim tests deploy
	$(BIN)/ruff format --check palimpsest bench ollama_sim tests deploy

# mypy over palimpsest/ with the generated .pyi stubs (settings in pyproject.toml).
typecheck: install
	$(BIN)/python -m mypy

run: install
	$(BIN)/python -m palimpsest.run

demo: install
	$(BIN)/python -m ollama_sim.demo

test: install
	$(BIN)/python -m pytest -n 2 -q

# The pure tests: no server, no database, no simulator (the `services` marker, set in tests/conftest.py),
# and none of the few that take seconds of CPU each (the `slow` marker).
test-fast: install
	$(BIN)/python -m pytest -n 2 -q -m "not services and not slow"

# The SessionStore tests alone (CI runs them again on the machine's PostgreSQL via TEST_DATABASE_URL).
test-store: install
	$(BIN)/python -m pytest -n 2 -q tests/store

bench: install
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) node_modules .pytest_cache
