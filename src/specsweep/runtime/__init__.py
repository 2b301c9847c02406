"""I/O: processes, HTTP client, concurrency driver, metrics scraper, storage."""
