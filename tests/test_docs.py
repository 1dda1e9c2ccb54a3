"""The generated recipe schema and field reference must match the pydantic models."""

from xtrain.project import docs


def test_recipe_schema_is_up_to_date():
    assert docs.SCHEMA_PATH.read_text() == docs.schema_text(), "run `make docs` and commit the result"


def test_recipe_reference_is_up_to_date():
    assert docs.REFERENCE_PATH.read_text() == docs.reference(), "run `make docs` and commit the result"


def test_reference_lists_every_field():
    text = docs.reference()
    for field in ("model.path", "data.sources[].path", "train.lora.r", "train.learning_rate", "hardware.gpus",
                  "eval.batch_size"):
        assert f"`{field}`" in text


def test_plan_field_table_is_current():
    assert docs.PLAN_PATH.read_text() == docs.plan_page(), "run `make docs` and commit the result"
    for field in ("layout.micro_batch_size", "time.cpu_probe.matmul_flops", "resources.mem_mb", "memory.breakdown_bytes"):
        assert f"`{field}`" in docs.plan_page()
