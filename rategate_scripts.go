package redsem

import "github.com/gomodule/redigo/redis"

// The RateGate's scripts. Each is lua/common.lua, then lua/rate_common.lua,
// then its own file: the rate scripts reuse the semaphore's helpers (token
// validity, give_back, argument checks) and share their own (queue, grant,
// serve). scripts.go's //go:embed lua/*.lua already embeds these files.
var (
	rateTakeScript  = newRateScript("rate_take.lua")
	rateAbortScript = newRateScript("rate_abort.lua")
)

// rateKeyCount is how many keys every rate script takes (see rate_common.lua).
const rateKeyCount = 7

func newRateScript(file string) *redis.Script {
	return redis.NewScript(rateKeyCount, mustRead("common.lua")+"\n"+mustRead("rate_common.lua")+"\n"+mustRead(file))
}
