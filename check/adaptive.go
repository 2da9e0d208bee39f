package main

import (
	"time"

	"github.com/dlock-go/dlock"
)

// The adaptive-lease scenarios (scenario.adaptive): the workers lock with
// dlock.WithAdaptiveTTL(adaptiveMin, TTL), so each acquisition's lease is chosen by the server
// from the lock's recorded holds, at most the TTL. The faults and the analysis keep to the
// TTL: a pause or a cut past the TTL is past every lease the server can choose, and a killed
// holder's lock must free within TTL + killRecoverySlack (the adaptive lease is the shorter).

// adaptiveMin is the least lease of the adaptive scenarios' workers.
const adaptiveMin = 50 * time.Millisecond

// leaseOption is a worker's lease: WithTTL(conf.TTL), or the adaptive lease up to it.
func leaseOption(conf workerConf) dlock.ClientOption {
	if conf.AdaptiveMin > 0 {
		return dlock.WithAdaptiveTTL(conf.AdaptiveMin, conf.TTL)
	}
	return dlock.WithTTL(conf.TTL)
}
