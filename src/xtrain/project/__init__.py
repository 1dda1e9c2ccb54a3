"""The project's own files that code makes or keeps in step: the pinned software environments, their locks and
the backends' virtual environments (`envs`, rule `build_backend_env`), the recipe's JSON schema and the generated
docs (`docs`, `make docs`), and `dvc.yaml` (`dvc_stages`, `make dvc.yaml`)."""
