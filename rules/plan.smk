rule plan:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
    output:
        "plans/{recipe}/plan.json",
    params:
        recipe=recipe_slice("plan"),
    log:
        "logs/{recipe}/plan.log",
    conda:
        "../envs/xtrain.yaml"
    script:
        "../scripts/plan.py"
