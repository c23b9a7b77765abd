import sys

from gcc.tools.sample.cli import main

if __name__ == "__main__":
    sys.exit(main())
