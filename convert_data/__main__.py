import sys

from gcc.data.convert import main

sys.exit(main())
