package dueflow

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// UUID7 is the job id the Python SDK draws: a UUIDv7 (RFC 9562) for nowMs as 32 hex
// digits, from 10 random bytes r (hex digits 0-2 and 4-18 of r are used).
func UUID7(nowMs int64, r [10]byte) string {
	digits := hex.EncodeToString(r[:])
	return fmt.Sprintf("%012x", uint64(nowMs)&0xFFFFFFFFFFFF) + "7" + digits[:3] + "8" + digits[4:19]
}

// NewJobID draws a UUIDv7 job id for nowMs.
func NewJobID(nowMs int64) string {
	var r [10]byte
	if _, err := rand.Read(r[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return UUID7(nowMs, r)
}
