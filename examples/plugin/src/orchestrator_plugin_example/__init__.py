"""The plugin's declarations: what `orchestrator validate` imports to check a study that names them.
They import no torch; the modules they point to (`losses`, `poolings`) load only inside a trial."""

from trainables.objectives.base import Objective
from trainables.poolings.base import Pooling

CONTRASTIVE = Objective(
    task="pair_classification", loss="orchestrator_plugin_example.losses:ContrastiveLoss",
    description="Hadsell et al. (2006) as sentence-transformers' ContrastiveLoss: cosine distance, margin 0.5")
WEIGHTED_MEAN = Pooling(
    module="orchestrator_plugin_example.poolings:WeightedMeanPooling", sentence_transformers="weightedmean",
    description="the mean of the real tokens' states weighted by position (1, 2, 3, ...), as SGPT")
