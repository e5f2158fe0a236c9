"""A small shop: a FastAPI application that enqueues skiplock tasks in the request's transaction."""
