# `snakemake smoke/<recipe>`: the recipe's own path on the CPU in minutes (src/xtrain/smoke), before it goes to GPUs.
# Nothing under smoke/ is an input of another rule; rule all does not ask for it.
rule smoke:
    input:
        sources=data_sources,
        model=root_model_dir,
        env=cpu_backend_env,
    output:
        directory("smoke/{recipe}"),
    log:
        "logs/{recipe}/smoke.log",
    conda:
        train_env
    container:
        train_container
    threads: workflow.cores
    resources:
        mem_mb=8192,
        runtime=30,
    params:
        recipe=recipe_slice("smoke"),
        gpu_hour_prices=config.get("gpu_hour_prices", {}),
    script:
        "../scripts/smoke.py"
