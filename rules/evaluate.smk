rule evaluate:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
        checkpoint="checkpoints/{recipe}",
    output:
        "reports/{recipe}/eval.json",
    params:
        recipe=recipe_slice("evaluate"),
    log:
        "logs/{recipe}/evaluate.log",
    conda:
        "../envs/xtrain.yaml"
    script:
        "../scripts/evaluate.py"
