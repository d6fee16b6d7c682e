/**
 * Child process of exit-wakes-threads.test.ts: opens an FfiUdpBind on loopback, waits until its
 * reader thread sits in poll(2), says so, then ends the way `how` says (argv[2]):
 *   - `throw`: an uncaught exception, as the bind itself raises when its reader fails;
 *   - `exit`: process.exit(3) without closing anything.
 */
import { FfiUdpBind } from '../../dataplane/bind/ffi-udp-bind.ts';

const how = process.argv[2];
const bind = new FfiUdpBind({ watchdog: false });
await bind.open(0);
await bind.ready();
process.stdout.write('reader running\n');
setTimeout(() => {
  if (how === 'exit') process.exit(3);
  throw new Error('an uncaught exception on purpose');
}, 100);
