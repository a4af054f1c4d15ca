-- redis-fence.lua: write a value to Redis only if the run's fencing token is above the value's fence.
--
-- KEYS[1]  the resource's fence: the highest token that has written it (decimal text)
-- KEYS[2]  the resource's value
-- ARGV[1]  the run's token (REDCRON_FENCING_TOKEN), ARGV[2] the value
-- Answers {1, token} when written, {0, fence} when refused (a run with a higher token wrote first;
-- nothing changed), an error when the token or the stored fence is not a decimal integer.
--
-- Guarantees: the check and the write are one script, and Redis runs a script atomically (no command of
-- another client runs between its commands), so once a run with token t has written, no run with a token
-- at or below t writes the resource again — however late it comes. Tokens are compared exactly at any
-- size, by length and then 15 digits at a time, as redcron's own scripts compare them: never as Lua
-- numbers, which are doubles, exact only below 2^53 (tonumber makes 2^53 and 2^53 + 1 equal), and never
-- as Lua strings, which compare by the server's locale.
--
-- Limits: only writes that go through this script are fenced. Both keys must be on one node (in a Redis
-- Cluster, give them one hash tag, as redis.sh does: {resource}:fence and {resource}:value). A failover
-- to a replica that had not received the write can lose the fence with the value (WAIT, or persistence,
-- as for any Redis data); a fence that is lost or deleted lets the next write through, whatever its token.

local function digits(text)
  if type(text) ~= 'string' then
    return nil
  end
  return string.match(text, '^0*(%d+)$')
end

-- Whether the decimal integer a is below b (both digit strings without leading zeros): the shorter is
-- smaller; equal lengths compare 15 digits at a time, each chunk below 10^15 < 2^53, so exact.
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  for i = 1, #a, 15 do
    local x = tonumber(string.sub(a, i, i + 14))
    local y = tonumber(string.sub(b, i, i + 14))
    if x ~= y then
      return x < y
    end
  end
  return false
end

local token = digits(ARGV[1])
if not token then
  return redis.error_reply('fence: the token ' .. tostring(ARGV[1]) .. ' is not a decimal integer')
end
local stored = redis.call('GET', KEYS[1])
if stored then
  local fence = digits(stored)
  if not fence then
    return redis.error_reply('fence: ' .. KEYS[1] .. ' holds no decimal integer')
  end
  if not below(fence, token) then
    return {0, fence}
  end
end
redis.call('SET', KEYS[1], token)
redis.call('SET', KEYS[2], ARGV[2])
return {1, token}
