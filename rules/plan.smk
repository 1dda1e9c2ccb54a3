rule plan:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
    output:
        "plans/{recipe}/plan.json",
    log:
        "logs/{recipe}/plan.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        recipe=recipe_slice("plan"),
    script:
        "../scripts/plan.py"


# The jobs after training get plans of their own (src/xtrain/plan/jobs.py): an edit to `eval:` or `export:`
# re-plans that job alone and leaves plan.json, and so the checkpoint, as they are.
rule plan_evaluate:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
        plan="plans/{recipe}/plan.json",
    output:
        "plans/{recipe}/evaluate.json",
    log:
        "logs/{recipe}/plan_evaluate.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        recipe=recipe_slice("plan_evaluate"),
    script:
        "../scripts/plan_job.py"


rule plan_export:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
        plan="plans/{recipe}/plan.json",
    output:
        "plans/{recipe}/export.json",
    log:
        "logs/{recipe}/plan_export.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        recipe=plan_export_slice,
    script:
        "../scripts/plan_job.py"
