package dueflow

// Murmur2 is Kafka's Utils.murmur2: the hash of the default key partitioner.
func Murmur2(data []byte) int32 {
	const m = uint32(0x5bd1e995)
	length := len(data)
	h := uint32(0x9747b28c) ^ uint32(length)
	n := length / 4
	for i := 0; i < n; i++ {
		j := i * 4
		k := uint32(data[j]) | uint32(data[j+1])<<8 | uint32(data[j+2])<<16 | uint32(data[j+3])<<24
		k *= m
		k ^= k >> 24
		k *= m
		h *= m
		h ^= k
	}
	tail := n * 4
	switch length % 4 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// KeyPartition is the partition of a keyed record among partitions (Java's default partitioner).
func KeyPartition(key []byte, partitions int32) int32 {
	return (Murmur2(key) & 0x7fffffff) % partitions
}
