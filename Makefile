# Thin wrapper over CMake for the README's commands: run, test, test-asan, bench.
BUILD      ?= build
ASAN_BUILD ?= build-asan
REL_BUILD  ?= build-release
JOBS       ?= $(shell nproc)
# Tests run two per core: most of the suite waits (heartbeats, timeouts, flushes held
# under strace), and on 2 cores two at a time kept the CPUs a quarter busy; four at a
# time took the suite from 450 to 225 s (the sanitizer run to 275 s), none failing.
TEST_JOBS  ?= $(shell echo $$(( $(JOBS) * 2 )))
DATA_DIR   ?= ./muster-data
# More `muster head` options for `make run`, e.g. a second user on one machine:
# make run ARGS="--listen 127.0.0.1:7380 --name mine --lock-file /tmp/mine.lock"
ARGS       ?=

.PHONY: all build run test test-asan build-release bench format clean

all: build

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

# The main job: a head on loopback with its embedded SQLite store.
run: build
	$(BUILD)/muster head --data-dir $(DATA_DIR) $(ARGS)

# Every test: unit, integration, a warning-free optimised build (-O3 finds warnings
# the default build does not), then the same suite under the sanitizers.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS)
	$(MAKE) build-release
	$(MAKE) test-asan

build-release:
	cmake -S . -B $(REL_BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(REL_BUILD) -j $(JOBS)

test-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DMUSTER_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(TEST_JOBS)

bench: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS) --target muster_bin bench_cycle bench_iter bench_shared
	bench/run

format:
	clang-format -i include/*.h src/*/*.[ch] tests/*/*.c bench/*.c

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(REL_BUILD)
