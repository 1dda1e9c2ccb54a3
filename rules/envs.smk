rule build_backend_env:
    input:
        spec=venv_spec,
        lock="envs/{venv}.lock",
    output:
        ".venvs/{venv}/ready.json",
    log:
        "logs/envs/{venv}.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        uninstall=backend_uninstall,
        accelerator=venv_accelerator,
    script:
        "../scripts/build_backend_env.py"
