rule build_lane_env:
    input:
        spec="envs/{backend}.yaml",
    output:
        ".venvs/{backend}/ready.json",
    params:
        uninstall=lane_uninstall,
    log:
        "logs/envs/{backend}.log",
    conda:
        "../envs/xtrain.yaml"
    script:
        "../scripts/build_lane_env.py"
