"""`kops bench`: figures measured as a user meets the service (over HTTP, real model), side by
side with the model's own limit, the pipeline's own ceiling and a peer pipeline."""
