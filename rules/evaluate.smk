rule evaluate:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
        checkpoint="checkpoints/{recipe}",
        chain=chain_checkpoints,
        lm_eval_tasks=lm_eval_tasks,
        job_plan="plans/{recipe}/evaluate.json",
    output:
        metrics="reports/{recipe}/eval.json",
        generations="reports/{recipe}/generations.json",
        pairs="reports/{recipe}/pairs.json",
    log:
        "logs/{recipe}/evaluate.log",
    benchmark:
        "benchmarks/{recipe}/evaluate.tsv"
    conda:
        "../envs/xtrain.yaml"
    threads: workflow.cores
    resources:
        mem_mb=planned("mem_mb", 4096, "job_plan"),
        runtime=planned("runtime", 60, "job_plan"),
        gpu=planned("gpus", 0, "job_plan"),
        cpus_per_task=planned("cpus", 2, "job_plan"),
    params:
        recipe=recipe_slice("evaluate"),
    script:
        "../scripts/evaluate.py"


rule report:
    input:
        plan="plans/{recipe}/plan.json",
        prepared="prepared/{recipe}",
        checkpoint="checkpoints/{recipe}",
        metrics="reports/{recipe}/eval.json",
        generations="reports/{recipe}/generations.json",
        pairs="reports/{recipe}/pairs.json",
    output:
        html="reports/{recipe}/report.html",
        metrics_plot=report("reports/{recipe}/plots/metrics.svg", category="{recipe}", labels={"plot": "base vs tuned"}),
        training_plot=report("reports/{recipe}/plots/training.svg", category="{recipe}", labels={"plot": "training"}),
        lengths_plot=report("reports/{recipe}/plots/lengths.svg", category="{recipe}", labels={"plot": "token lengths"}),
    log:
        "logs/{recipe}/report.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        recipe=recipe_slice("report"),
    script:
        "../scripts/report.py"


# After the report, so a failing gate fails the workflow while eval.json and report.html stay.
rule gate:
    input:
        metrics="reports/{recipe}/eval.json",
        report="reports/{recipe}/report.html",
    output:
        "reports/{recipe}/gate.json",
    log:
        "logs/{recipe}/gate.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        recipe=recipe_slice("gate"),
    script:
        "../scripts/gate.py"


rule compare:
    input:
        expand("reports/{recipe}/eval.json", recipe=RECIPE_NAMES),
    output:
        "reports/compare.html",
    log:
        "logs/compare.log",
    conda:
        "../envs/xtrain.yaml"
    script:
        "../scripts/compare.py"
