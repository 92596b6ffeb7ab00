import os
import sys

# D185: `-m` put the working directory first (not under -P); the launcher's own imports must not
# come from it. The program's first entry goes in when it starts (cli._program_path0)
if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402

sys.exit(main())
