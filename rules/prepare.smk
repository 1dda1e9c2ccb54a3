rule prepare:
    input:
        sources=data_sources,
        model=model_dir,
    output:
        directory("prepared/{recipe}"),
    log:
        "logs/{recipe}/prepare.log",
    benchmark:
        "benchmarks/{recipe}/prepare.tsv"
    threads: workflow.cores
    conda:
        "../envs/xtrain.yaml"
    params:
        recipe=recipe_slice("prepare"),
    script:
        "../scripts/prepare.py"
