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
