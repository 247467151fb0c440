"""``python -m paternoster.simulate``: the simulator's command line."""

from paternoster.simulate.cli import main

raise SystemExit(main())
