"""The `gpulab` command line."""

import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    print("usage: gpulab {plan,lab} ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
