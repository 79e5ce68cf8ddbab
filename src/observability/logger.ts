import { pino, type DestinationStream, type Level, type Logger } from 'pino';

/**
 * The logger every process of the server writes JSON lines with. An error's cause is logged as a field
 * of its own (pino's errWithCause serializer) rather than as pino's default has it, each cause's message
 * appended to the error's: the API's errors say in their message what their cause is, so a 507 was
 * logged as "...or a higher MEMORY_LIMIT.: Model 'sd15' needs...", the same words twice.
 */
export function createLogger(level: Level | 'silent', destination?: DestinationStream): Logger {
  return pino({ level, serializers: { err: pino.stdSerializers.errWithCause } }, destination);
}
