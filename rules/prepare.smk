rule prepare:
    input:
        sources=data_sources,
        model=model_dir,
    output:
        directory("prepared/{recipe}"),
    params:
        recipe=recipe_slice("prepare"),
    log:
        "logs/{recipe}/prepare.log",
    conda:
        "../envs/xtrain.yaml"
    script:
        "../scripts/prepare.py"
