"""`python -m drumsd.bench`: the runtime bench, as `drumsd bench`."""

import argparse
import sys

from drumsd.bench.runtime import add_bench_args, main_bench

p = argparse.ArgumentParser(prog="drumsd bench")
add_bench_args(p)
sys.exit(main_bench(p.parse_args()))
