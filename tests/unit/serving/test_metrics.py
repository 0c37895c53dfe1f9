"""ServerMetrics: the compile-bucket miss counter is read from the engine at scrape time."""

from vidloom.serving.metrics import ServerMetrics


def test_compile_bucket_misses_are_exported_as_a_counter():
    misses = [0]
    metrics = ServerMetrics(lambda: 0, lambda: 0, lambda: misses[0])
    assert b"vidloom_compile_bucket_misses_total 0.0" in metrics.exposition()
    misses[0] = 3
    text = metrics.exposition().decode()
    assert "# TYPE vidloom_compile_bucket_misses_total counter" in text
    assert "vidloom_compile_bucket_misses_total 3.0" in text
