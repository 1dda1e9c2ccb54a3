rule build_lane_env:
    input:
        spec="envs/{backend}.yaml",
    output:
        ".venvs/{backend}/ready.json",
    log:
        "logs/envs/{backend}.log",
    conda:
        "../envs/xtrain.yaml"
    params:
        uninstall=lane_uninstall,
    script:
        "../scripts/build_lane_env.py"
