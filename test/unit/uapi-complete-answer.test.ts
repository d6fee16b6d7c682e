import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isCompleteAnswer } from '../../dataplane/uapi/uapi-client.ts';

test('an answer is complete exactly when its last line is errno=N followed by an empty line', () => {
  for (const complete of ['errno=0\n\n', 'errno=-22\n\n', 'listen_port=1\nerrno=0\n\n', `${'allowed_ip=10.0.0.0/24\n'.repeat(50_000)}errno=0\n\n`]) {
    assert.equal(isCompleteAnswer(complete), true, JSON.stringify(complete.slice(-40)));
  }
  for (const partial of [
    '', '\n\n', 'errno=0\n', 'errno=0', 'errno=\n\n', 'errno=x\n\n', 'errno=0\n\n\n', 'xerrno=0\n\n',
    'public_key=aa\nrx_errno=0\n\n', 'errno=0\nlisten_port=1\n\n', `${'allowed_ip=10.0.0.0/24\n'.repeat(50_000)}errno=0\n`,
  ]) {
    assert.equal(isCompleteAnswer(partial), false, JSON.stringify(partial.slice(-40)));
  }
});
