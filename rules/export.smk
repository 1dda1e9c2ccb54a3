# Only recipes with an `export:` section have this target; rule all asks for it (exported_recipes in common.smk).
# After evaluation: the export's model card carries the eval.json figures.
rule export:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
        checkpoint="checkpoints/{recipe}",
        metrics="reports/{recipe}/eval.json",
        job_plan="plans/{recipe}/export.json",
    output:
        directory("exports/{recipe}"),
    log:
        "logs/{recipe}/export.log",
    benchmark:
        "benchmarks/{recipe}/export.tsv"
    conda:
        "../envs/xtrain.yaml"
    threads: workflow.cores
    resources:
        mem_mb=planned("mem_mb", 4096, "job_plan"),
        runtime=planned("runtime", 60, "job_plan"),
        cpus_per_task=planned("cpus", 2, "job_plan"),
    params:
        recipe=export_slice,
    script:
        "../scripts/export.py"


# A LoRA recipe another recipe builds on (model.recipe, model.adapter: merge) is merged into its base once; the
# recipes on it train, evaluate and export on bases/<recipe> (xtrain.chain).
rule merge_base:
    input:
        model=model_dir,
        checkpoint="checkpoints/{recipe}",
    output:
        directory("bases/{recipe}"),
    log:
        "logs/{recipe}/merge_base.log",
    conda:
        "../envs/xtrain.yaml"
    threads: workflow.cores
    resources:
        mem_mb=merge_memory_mb,
        runtime=60,
    params:
        recipe=recipe_slice("merge_base"),
    script:
        "../scripts/merge_base.py"
