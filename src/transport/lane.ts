/**
 * A wake-up lane: the stages of one tool class and one workflow definition (its hash). Workers
 * listen on the lanes of the definitions they have loaded, so a wake-up reaches a worker that
 * can claim its stage; one queue per class would hand a stage of a version to a worker that
 * lacks it, which claims nothing and acknowledges the wake-up, and the worker that has the
 * version would only find the stage at its next poll. Tool class names hold no '.'.
 */
export function laneOf(toolClass: string, definitionHash: string): string {
  return `${toolClass}.${definitionHash.slice(0, 16)}`;
}
