"""The Agent's warm sessions stay within their count and byte budgets."""

from palimpsest.agent.warm_cache import WarmCache


def test_bytes_bound_the_cache_oldest_out_first():
    cache: WarmCache[str] = WarmCache(max_entries=100, max_bytes=1000)
    for i in range(10):
        cache.put(f"s{i}", f"session {i}", 200)
    assert cache.bytes <= 1000 and len(cache) == 5
    assert cache.pop("s4") is None and cache.pop("s9") == "session 9"
    assert cache.bytes == 800


def test_count_bounds_it_too_and_a_replaced_entry_is_not_counted_twice():
    cache: WarmCache[int] = WarmCache(max_entries=2, max_bytes=10_000)
    cache.put("a", 1, 10)
    cache.put("a", 2, 20)
    assert cache.bytes == 20 and len(cache) == 1
    cache.put("b", 3, 10)
    cache.put("c", 4, 10)
    assert cache.pop("a") is None and len(cache) == 2 and cache.bytes == 20


def test_a_session_too_big_to_be_worth_keeping_is_not_kept():
    cache: WarmCache[str] = WarmCache(max_entries=10, max_bytes=1000)
    cache.put("small", "x", 100)
    cache.put("huge", "y", 251)  # over a quarter of the budget
    assert cache.pop("huge") is None and cache.pop("small") == "x"
