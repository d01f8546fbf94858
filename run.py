"""zoo's command line: `python run.py model=vit`, `python run.py -m model=gpt attention=full,local`.

The whole path is `zoo.app.run(overrides)` (docs/architecture.md): the command line is checked and a resume
planned, Hydra composes conf/ and makes the run directory, zoo.app.job runs the mode cfg.mode names (train:
zoo.app.train.train, which fits and then tests the best checkpoint). Bad input ends as one line, exit status 2.
"""

import sys

from zoo.app import run

if __name__ == "__main__":
    run(sys.argv[1:])
