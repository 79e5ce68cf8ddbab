/**
 * What a client can send as an API key: RFC 6750's b64token, what may follow "Bearer " in an
 * Authorization header. A configured key outside it (a space, a quote) could never be sent, so every
 * client would be refused with it; configuration refuses it instead.
 */
export const BEARER_TOKEN = /^[A-Za-z0-9._~+/-]+=*$/;
