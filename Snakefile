# xtrain: each recipe in recipes/ becomes prepared data -> plan.json -> checkpoint -> evaluation report -> gate,
# and an export when it asks for one.
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
include: "rules/export.smk"
include: "rules/smoke.smk"


# The gate of each recipe comes after its eval.json and report.html; `snakemake compare` ranks the recipes.
# Recipes with an `export:` section are exported too.
rule all:
    default_target: True
    input:
        expand("reports/{recipe}/gate.json", recipe=RECIPE_NAMES),
        expand("exports/{recipe}", recipe=exported_recipes()),


# The run ends on what each recipe's jobs came to: report, held-out figures, gate verdict, export, or what failed.
onsuccess:
    end_of_run()


onerror:
    end_of_run()
