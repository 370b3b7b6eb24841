"""The Lua scripts of the Redis quota store: each call is one atomic check-and-consume.

Why Lua: Redis runs a script to completion with nothing interleaved, so many
gateways checking the same limit cannot both see the last free unit (the
race a GET-then-INCR would have). Every script takes the same argument layout:

    ARGV[1] now (epoch seconds; empty: use the Redis server's clock, so all
            gateways share one clock), ARGV[2] reservation id, ARGV[3] number of
            checks, then 6 values per check: kind, limit, p1, amount, p2, p3
    KEYS    per check: window 'w' -> zset(rid->time), hash(total, r:<rid> -> weight)
                       slots 'c'  -> zset(rid->lease expiry)
                       budget 'b' -> hash(spent, reserved, r:<rid> -> amount),
                                     zset(rid->lease expiry)
    p1/p2   window: window_s / -;  slots: lease_s / retry_after_s;
            budget: lease_s / period_end
    p3      budget: the floor of `spent` (ADMIT raises `spent` to it); else 0

Requires Redis >= 3.2 (effects replication, so a script may read TIME before
writing). Amounts are integers below 2**53 (Lua numbers are doubles): 9e15 tokens, or
9 billion currency units in micro-units. Retry-after values come back in
integer milliseconds, -1 meaning that waiting cannot help.

ADMIT answers `{1, windows...}` when admitted, `{0, n, (check, retry_ms) * n, windows...}`
when refused; `windows` is (check, total, reset_ms) per window check, read after the
decision, for the rate-limit headers.
"""

from __future__ import annotations

_COMMON = r"""
if redis.replicate_commands then redis.replicate_commands() end  -- Redis < 7: allow TIME
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local rid = ARGV[2]
local n = tonumber(ARGV[3])
local GRACE_MS = 60000

local function expire_weighted(z, h, cutoff, total_field)
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', cutoff)
  if #old == 0 then return end
  local freed = 0
  for _, m in ipairs(old) do
    freed = freed + (tonumber(redis.call('HGET', h, 'r:' .. m)) or 0)
    redis.call('HDEL', h, 'r:' .. m)
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', cutoff)
  if freed ~= 0 then redis.call('HINCRBY', h, total_field, -freed) end
end

local function field(h, name)
  return tonumber(redis.call('HGET', h, name)) or 0
end

-- Iterate checks: calls fn(i, kind, keys_table, limit, p1, amount, p2, p3).
local function each_check(fn)
  local ki, ai = 1, 4
  for i = 1, n do
    local kind = ARGV[ai]
    local limit, p1 = tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
    local amount, p2 = tonumber(ARGV[ai + 3]), tonumber(ARGV[ai + 4])
    local p3 = tonumber(ARGV[ai + 5])
    ai = ai + 6
    local keys
    if kind == 'c' then keys = {KEYS[ki]}; ki = ki + 1
    else keys = {KEYS[ki], KEYS[ki + 1]}; ki = ki + 2 end
    fn(i, kind, keys, limit, p1, amount, p2, p3)
  end
end

local function cleanup(kind, keys, p1)
  if kind == 'w' then expire_weighted(keys[1], keys[2], now - p1, 'total')
  elseif kind == 'c' then redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', now)
  else expire_weighted(keys[2], keys[1], now, 'reserved') end
end

local function ms(seconds)
  if seconds == nil then return -1 end
  return math.max(1, math.ceil(seconds * 1000))
end
"""

ADMIT = (
    _COMMON
    + r"""
-- Appends (check index, total, ms until its oldest entry leaves) per window check: what
-- the rate-limit headers need, from this same call.
local function window_states(out)
  each_check(function(i, kind, keys, limit, p1, amount, p2)
    if kind ~= 'w' then return end
    local oldest = redis.call('ZRANGE', keys[1], 0, 0, 'WITHSCORES')
    local reset = 0
    if #oldest > 0 then
      reset = math.max(0, math.ceil((tonumber(oldest[2]) + p1 - now) * 1000))
    end
    out[#out + 1] = i
    out[#out + 1] = field(keys[2], 'total')
    out[#out + 1] = reset
  end)
  return out
end

local refusals = {}
each_check(function(i, kind, keys, limit, p1, amount, p2, p3)
  cleanup(kind, keys, p1)
  if kind == 'b' and p3 > field(keys[1], 'spent') then
    redis.call('HSET', keys[1], 'spent', p3)
  end
  local retry = false
  if kind == 'w' then
    local total = field(keys[2], 'total')
    if total + amount > limit then
      retry = nil
      if amount <= limit then
        local need, freed = total + amount - limit, 0
        local entries = redis.call('ZRANGE', keys[1], 0, -1, 'WITHSCORES')
        for j = 1, #entries, 2 do
          freed = freed + field(keys[2], 'r:' .. entries[j])
          if freed >= need then retry = tonumber(entries[j + 1]) + p1 - now; break end
        end
      end
    end
  elseif kind == 'c' then
    if redis.call('ZCARD', keys[1]) + 1 > limit then retry = p2 end
  else
    local spent = field(keys[1], 'spent')
    if spent + field(keys[1], 'reserved') + amount > limit then
      if amount > limit then retry = nil
      elseif spent + amount <= limit then retry = 1
      else retry = math.max(p2 - now, 1) end
    end
  end
  if retry ~= false then
    refusals[#refusals + 1] = i
    refusals[#refusals + 1] = ms(retry)
  end
end)
if #refusals > 0 then
  local reply = {0, #refusals / 2}
  for _, v in ipairs(refusals) do reply[#reply + 1] = v end
  return window_states(reply)
end
each_check(function(i, kind, keys, limit, p1, amount, p2)
  if kind == 'w' then
    redis.call('ZADD', keys[1], now, rid)
    redis.call('HSET', keys[2], 'r:' .. rid, amount)
    redis.call('HINCRBY', keys[2], 'total', amount)
    local ttl = math.ceil(p1 * 1000) + GRACE_MS
    redis.call('PEXPIRE', keys[1], ttl)
    redis.call('PEXPIRE', keys[2], ttl)
  elseif kind == 'c' then
    redis.call('ZADD', keys[1], now + p1, rid)
    redis.call('PEXPIRE', keys[1], math.ceil(p1 * 1000) + GRACE_MS)
  else
    redis.call('HINCRBY', keys[1], 'reserved', amount)
    redis.call('HSET', keys[1], 'r:' .. rid, amount)
    redis.call('ZADD', keys[2], now + p1, rid)
    local ttl = math.ceil(math.max(p2 - now, p1) * 1000) + GRACE_MS
    if redis.call('PTTL', keys[1]) < ttl then redis.call('PEXPIRE', keys[1], ttl) end
    if redis.call('PTTL', keys[2]) < ttl then redis.call('PEXPIRE', keys[2], ttl) end
  end
end)
return window_states({1})
"""
)

# amount: the actual amount to settle to, or -1 to keep what was recorded.
SETTLE = (
    _COMMON
    + r"""
each_check(function(i, kind, keys, limit, p1, amount, p2)
  if kind == 'w' then
    local old = redis.call('HGET', keys[2], 'r:' .. rid)
    if old and amount >= 0 then
      redis.call('HSET', keys[2], 'r:' .. rid, amount)
      redis.call('HINCRBY', keys[2], 'total', amount - tonumber(old))
    end
  elseif kind == 'c' then
    redis.call('ZREM', keys[1], rid)
  else
    local held = redis.call('HGET', keys[1], 'r:' .. rid)
    if held then
      redis.call('HDEL', keys[1], 'r:' .. rid)
      -- `0 - x`, not `-x`: Lua 5.1 writes -0 as "-0", which HINCRBY refuses (a 0 reservation)
      redis.call('HINCRBY', keys[1], 'reserved', 0 - tonumber(held))
      redis.call('ZREM', keys[2], rid)
    end
    if amount > 0 then redis.call('HINCRBY', keys[1], 'spent', amount) end
    if redis.call('PTTL', keys[1]) < 0 then
      redis.call('PEXPIRE', keys[1], math.ceil(math.max(p2 - now, 0) * 1000) + GRACE_MS)
    end
  end
end)
return 1
"""
)

# A long-lived budget reservation (a batch's) set to what its durable record says, as of a
# version (`QuotaBackend.resync`). Per budget check the six values are: 'b', lease_s (in
# place of the limit), the amount to hold (p1), the amount counted as spent in all
# (amount), period_end (p2), the version (p3). Applied only when newer than the version
# seen (`v:<rid>`); `s:<rid>` is what this reservation counted as spent so far, so the
# budget's `spent` moves by the difference. A reservation the store lost is held again.
RESYNC = (
    _COMMON
    + r"""
each_check(function(i, kind, keys, lease, held, amount, period_end, version)
  if kind ~= 'b' then return end
  cleanup(kind, keys, lease)
  local seen = tonumber(redis.call('HGET', keys[1], 'v:' .. rid)) or -1
  if version <= seen then return end
  redis.call('HSET', keys[1], 'v:' .. rid, version)
  local had = tonumber(redis.call('HGET', keys[1], 'r:' .. rid)) or 0
  local want = math.max(held, 0)
  if want > 0 then
    redis.call('HSET', keys[1], 'r:' .. rid, want)
    if not redis.call('ZSCORE', keys[2], rid) then redis.call('ZADD', keys[2], now + lease, rid) end
  else
    redis.call('HDEL', keys[1], 'r:' .. rid)
    redis.call('ZREM', keys[2], rid)
  end
  if want ~= had then redis.call('HINCRBY', keys[1], 'reserved', want - had) end
  local counted = tonumber(redis.call('HGET', keys[1], 's:' .. rid)) or 0
  local total = math.max(amount, 0)
  if total ~= counted then
    redis.call('HINCRBY', keys[1], 'spent', total - counted)
    redis.call('HSET', keys[1], 's:' .. rid, total)
  end
  local ttl = math.ceil(math.max(period_end - now, lease) * 1000) + GRACE_MS
  if redis.call('PTTL', keys[1]) < ttl then redis.call('PEXPIRE', keys[1], ttl) end
  if redis.call('PTTL', keys[2]) < ttl then redis.call('PEXPIRE', keys[2], ttl) end
end)
return 1
"""
)

# Returns the number of leases that were no longer held.
RENEW = (
    _COMMON
    + r"""
local lost = 0
each_check(function(i, kind, keys, limit, p1, amount, p2)
  if kind == 'w' then return end
  cleanup(kind, keys, p1)
  local z = keys[1]
  if kind == 'b' then z = keys[2] end
  if redis.call('ZSCORE', z, rid) then
    redis.call('ZADD', z, now + p1, rid)
    local ttl = math.ceil(p1 * 1000) + GRACE_MS
    if redis.call('PTTL', z) < ttl then redis.call('PEXPIRE', z, ttl) end
  else
    lost = lost + 1
  end
end)
return lost
"""
)

# Returns {used, reserved} for one check, after dropping what has expired.
USAGE = (
    _COMMON
    + r"""
local result = {0, 0}
each_check(function(i, kind, keys, limit, p1, amount, p2)
  cleanup(kind, keys, p1)
  if kind == 'w' then result = {field(keys[2], 'total'), 0}
  elseif kind == 'c' then result = {redis.call('ZCARD', keys[1]), 0}
  else result = {field(keys[1], 'spent'), field(keys[1], 'reserved')} end
end)
return result
"""
)
