rule build_tiny_model:
    input:
        corpus=config["tiny_model"]["corpus"],
    output:
        directory(config["tiny_model"]["path"]),
    params:
        settings=config["tiny_model"]["settings"],
    log:
        "logs/build_tiny_model.log",
    conda:
        "../envs/xtrain.yaml"
    script:
        "../scripts/build_tiny_model.py"
