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
    conda:
        "../envs/xtrain.yaml"
    threads: workflow.cores
    params:
        recipe=recipe_slice("prepare"),
    script:
        "../scripts/prepare.py"
