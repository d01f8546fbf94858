"""zoo's command line: `python run.py model=vit`, `python run.py -m model=gpt attention=full,local`.

Thin by design: Hydra composes conf/, zoo.pipeline does the work and returns the metric named by
`optimized_metric` (what sweepers minimise or maximise).
"""

import hydra
from omegaconf import DictConfig

from zoo.pipeline import main as run_pipeline


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_pipeline(cfg)


if __name__ == "__main__":
    main()
