export { decodeJob, encodeJob, JobFields } from "./codec";
export {
  applied,
  cancelCommand,
  Command,
  CommandOptions,
  JobRef,
  MAX_COMMAND_ID_CHARS,
  moveCommand,
  patchCommand,
  PayloadUpdate,
  Verdict,
  verdictOf,
} from "./commands";
export { DueflowError, InvalidInputError } from "./errors";
export { DueflowProducer, DueflowProducerOptions } from "./producer";
export {
  canonicalJson,
  contentHash,
  DEFAULT_MAX_RECORD_BYTES,
  DEFAULT_RETENTION_MS,
  estimatedSize,
  frame,
  JobRequest,
  legacyCancelRecords,
  legacyRescheduleRecords,
  MAX_DUE_MS,
  newJobId,
  OutgoingRecord,
  Planned,
  planSchedule,
  ScheduledJob,
  Target,
  uuid7,
} from "./records";
export { registerSchema } from "./registry";
export { SentCommand } from "./verdicts";
export { crc32, DEFAULT_WHEEL, keyPartition, Level, murmur2, placeTimer, shardPartitions, Wheel } from "./wheel";
