# xtrain: each recipe in recipes/ becomes prepared data -> plan.json -> checkpoint -> evaluation report -> gate.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/envs.smk"
include: "rules/models.smk"
include: "rules/prepare.smk"
include: "rules/plan.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"


# The gate of each recipe comes after its eval.json and report.html; `snakemake compare` ranks the recipes.
rule all:
    default_target: True
    input:
        expand("reports/{recipe}/gate.json", recipe=sorted(RECIPES)),
