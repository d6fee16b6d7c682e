/** The namespace toolkit lives in lab/ (the local demo builds its world with it too). */
export * from '../../lab/netns.ts';
