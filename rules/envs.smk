rule build_backend_env:
    input:
        spec="envs/{backend}.yaml",
        lock="envs/{backend}.lock",
    output:
        ".venvs/{backend}/ready.json",
    log:
        "logs/envs/{backend}.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        uninstall=backend_uninstall,
    script:
        "../scripts/build_backend_env.py"
