# Only recipes with an `export:` section have this target; rule all asks for it (exported_recipes in common.smk).
# After evaluation: the export's model card carries the eval.json figures.
rule export:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
        checkpoint="checkpoints/{recipe}",
        metrics="reports/{recipe}/eval.json",
    output:
        directory("exports/{recipe}"),
    log:
        "logs/{recipe}/export.log",
    benchmark:
        "benchmarks/{recipe}/export.tsv"
    conda:
        "../envs/xtrain.yaml"
    threads: workflow.cores
    params:
        recipe=export_slice,
    script:
        "../scripts/export.py"
