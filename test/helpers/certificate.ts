import { execFileSync, spawnSync } from 'node:child_process';
import path from 'node:path';

/** Whether openssl is here to make a test certificate; where it is missing, HTTPS tests say so and skip. */
export const haveOpenssl = spawnSync('openssl', ['version']).status === 0;

/** A self-signed certificate for localhost, valid a day, written into `dir`: the PEM files' paths. */
export function selfSignedCertificate(dir: string): { cert: string; key: string } {
  const [cert, key] = [path.join(dir, 'cert.pem'), path.join(dir, 'key.pem')];
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=localhost'], { stdio: 'ignore' });
  return { cert, key };
}
