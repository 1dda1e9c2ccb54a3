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
