import sys

from gcc.convert import main

sys.exit(main())
